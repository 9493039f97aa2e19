rule compare:
    input:
        index=rules.capture.output.index,
        capture_manifest=rules.capture.output.manifest,
        predictions=rules.prediction.output.predictions,
        prediction_manifest=rules.prediction.output.manifest,
        protocol=protocol_files("compare"),
    output:
        layers=update(f"{RESULTS}/compare/layers.parquet"),
        summary=update(f"{RESULTS}/compare/summary.parquet"),
        manifest=update(f"{RESULTS}/compare/manifest.json"),
    log:
        f"{LOGS}/compare.log",
    benchmark:
        f"{BENCHMARKS}/compare.tsv"
    priority: rule_priority("compare")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("compare")
    resources:
        mem_mb=RESOURCES["compare"].mem_mb,
        runtime=RESOURCES["compare"].runtime,
        gpu=use_gpu(RUN),
        gpu_mem_mb=RESOURCES["compare"].gpu_mem_mb,
    params:
        **stage_params("compare"),
        # the pinned prediction digest: a new pin reruns compare
        pin=GATE.data_pins.get("predictions", "unpinned"),
    shell:
        stage_cmd(
            "compare",
            f"{RESULTS}/compare",
            "--input index={input.index} --input predictions={input.predictions}",
        )
        + " 2> {log:q}"
