checkpoint capture:
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        protocol=protocol_files("capture"),
    # Tensor folders beside the tables are listed and hashed by the manifest, declared only for
    # --delete-all-output (deleted_with in common.smk says why).
    output:
        **stage_outputs("capture"),
    log:
        f"{LOGS}/capture.log",
    benchmark:
        f"{BENCHMARKS}/capture.tsv"
    priority: rule_priority("capture")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("capture")
    resources:
        **stage_resources("capture"),
    params:
        **stage_params("capture"),
    shell:
        stage_cmd("capture", f"{RESULTS}/capture", "--input gate={input.gate}") + " 2> {log:q}"
