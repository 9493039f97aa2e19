rule prediction:
    input:
        index=rules.capture.output.index,
        capture_manifest=rules.capture.output.manifest,
        protocol=protocol_files("prediction"),
    output:
        **stage_outputs("prediction"),
    log:
        f"{LOGS}/prediction.log",
    benchmark:
        f"{BENCHMARKS}/prediction.tsv"
    priority: rule_priority("prediction")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("prediction")
    resources:
        **stage_resources("prediction"),
    params:
        **stage_params("prediction"),
    shell:
        stage_cmd("prediction", f"{RESULTS}/prediction", "--input index={input.index}") + " 2> {log:q}"
