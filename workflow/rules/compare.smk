rule compare:
    input:
        index=rules.capture.output.index,
        capture_manifest=rules.capture.output.manifest,
        predictions=rules.prediction.output.predictions,
        prediction_manifest=rules.prediction.output.manifest,
        protocol=protocol_files("compare"),
    output:
        **stage_outputs("compare"),
    log:
        f"{LOGS}/compare.log",
    benchmark:
        f"{BENCHMARKS}/compare.tsv"
    priority: rule_priority("compare")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("compare")
    resources:
        **stage_resources("compare"),
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
