rule tokens:
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        parent=rules.model.output.info,
        model_manifest=rules.model.output.manifest,
        protocol=protocol_files("tokens"),
    output:
        positions=update(f"{RESULTS}/tokens/positions.parquet"),
        pairs=update(f"{RESULTS}/tokens/pairs.parquet"),
        predictor=update(f"{RESULTS}/tokens/predictor.parquet"),
        check7=update(f"{RESULTS}/tokens/check7.parquet"),
        influence=update(f"{RESULTS}/tokens/influence.parquet"),
        manifest=update(f"{RESULTS}/tokens/manifest.json"),
    log:
        f"{LOGS}/tokens.log",
    benchmark:
        f"{BENCHMARKS}/tokens.tsv"
    priority: rule_priority("tokens")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("tokens")
    resources:
        mem_mb=RESOURCES["tokens"].mem_mb,
        runtime=RESOURCES["tokens"].runtime,
        gpu=use_gpu(RUN),
        gpu_mem_mb=RESOURCES["tokens"].gpu_mem_mb,
    params:
        **stage_params("tokens"),
    shell:
        stage_cmd("tokens", f"{RESULTS}/tokens", "--input gate={input.gate} --input parent={input.parent}")
        + " 2> {log:q}"
