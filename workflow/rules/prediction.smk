rule prediction:
    input:
        index=rules.capture.output.index,
        protocol=protocol_files("prediction"),
    output:
        predictions=f"{RESULTS}/prediction/predictions.parquet",
        manifest=f"{RESULTS}/prediction/manifest.json",
    params:
        code=code_digest("prediction"),
        cfg=config_digest(config, ["device"]),
    log:
        f"{LOGS}/prediction.log",
    benchmark:
        f"{BENCHMARKS}/prediction.tsv"
    threads: workflow.cores
    resources:
        mem_mb=8000,
        gpu=use_gpu(config),
    shell:
        stage_cmd("prediction", f"{RESULTS}/prediction", "--input index={input.index}") + " 2> {log}"
