rule faults:
    input:
        index=rules.capture.output.index,
        protocol=protocol_files("faults"),
    output:
        cells=f"{RESULTS}/faults/cells.parquet",
        scorecard=f"{RESULTS}/faults/scorecard.parquet",
        detection=f"{RESULTS}/faults/detection.parquet",
        ulp=f"{RESULTS}/faults/ulp_distribution.parquet",
        manifest=f"{RESULTS}/faults/manifest.json",
    params:
        code=code_digest("faults"),
        cfg=config_digest(config, ["device", "exploratory"]),
    log:
        f"{LOGS}/faults.log",
    benchmark:
        f"{BENCHMARKS}/faults.tsv"
    threads: workflow.cores
    resources:
        mem_mb=8000,
        gpu=use_gpu(config),
    shell:
        stage_cmd("faults", f"{RESULTS}/faults", "--input operands={input.index}") + " 2> {log}"


rule faults_smoke:
    """The disclosed smoke run: the campaign on the first two captured layers only."""
    input:
        index=rules.capture.output.index,
        protocol=protocol_files("faults"),
    output:
        cells=f"{RESULTS}/faults_smoke/cells.parquet",
        scorecard=f"{RESULTS}/faults_smoke/scorecard.parquet",
        detection=f"{RESULTS}/faults_smoke/detection.parquet",
        ulp=f"{RESULTS}/faults_smoke/ulp_distribution.parquet",
        manifest=f"{RESULTS}/faults_smoke/manifest.json",
    params:
        code=code_digest("faults"),
        cfg=config_digest(config, ["device", "exploratory"]),
    log:
        f"{LOGS}/faults_smoke.log",
    threads: workflow.cores
    resources:
        mem_mb=4000,
        gpu=use_gpu(config),
    shell:
        stage_cmd(
            "faults", f"{RESULTS}/faults_smoke", "--input operands={input.index} --param layers=2"
        ) + " 2> {log}"
