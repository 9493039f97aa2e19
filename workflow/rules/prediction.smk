rule prediction:
    input:
        index=rules.capture.output.index,
        capture_manifest=rules.capture.output.manifest,
        protocol=protocol_files("prediction"),
    output:
        predictions=update(f"{RESULTS}/prediction/predictions.parquet"),
        manifest=update(f"{RESULTS}/prediction/manifest.json"),
    log:
        f"{LOGS}/prediction.log",
    benchmark:
        f"{BENCHMARKS}/prediction.tsv"
    priority: rule_priority("prediction")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("prediction")
    resources:
        mem_mb=RESOURCES["prediction"].mem_mb,
        runtime=RESOURCES["prediction"].runtime,
        gpu=use_gpu(RUN),
        gpu_mem_mb=RESOURCES["prediction"].gpu_mem_mb,
    params:
        **stage_params("prediction"),
    shell:
        stage_cmd("prediction", f"{RESULTS}/prediction", "--input index={input.index}") + " 2> {log:q}"
