FAULT_TABLES = ["cells", "scorecard", "detection", "ulp_distribution"]


if int(config.get("faults_shards", 1)) <= 1:

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
            cfg=config_digest(RUN, ["device", "exploratory"]),
            env=ENVIRONMENT,
        log:
            f"{LOGS}/faults.log",
        benchmark:
            f"{BENCHMARKS}/faults.tsv"
        threads: 2
        resources:
            mem_mb=8000,
            gpu=use_gpu(RUN),
        shell:
            stage_cmd("faults", f"{RESULTS}/faults", "--input operands={input.index}") + " 2> {log}"

else:
    # Scatter/gather for a cluster: layer ranges run as separate jobs, then one gather writes the
    # campaign's tables (byte-identical to a single run: rows are sorted by key on write).

    def faults_shard_dirs(wildcards):
        index = checkpoints.capture.get().output.index
        return [f"{RESULTS}/faults/shards/{a}_{b}" for a, b in shard_ranges(index, int(config["faults_shards"]))]

    rule faults_shard:
        input:
            index=rules.capture.output.index,
            protocol=protocol_files("faults"),
        output:
            manifest=f"{RESULTS}/faults/shards/{{start}}_{{stop}}/manifest.json",
        wildcard_constraints:
            start=r"\d+",
            stop=r"\d+",
        params:
            code=code_digest("faults"),
            cfg=config_digest(RUN, ["device", "exploratory"]),
            env=ENVIRONMENT,
        log:
            f"{LOGS}/faults/shard_{{start}}_{{stop}}.log",
        benchmark:
            f"{BENCHMARKS}/faults/shard_{{start}}_{{stop}}.tsv"
        threads: 2
        resources:
            mem_mb=8000,
            gpu=use_gpu(RUN),
        shell:
            stage_cmd(
                "faults",
                f"{RESULTS}/faults/shards/{{wildcards.start}}_{{wildcards.stop}}",
                "--input operands={input.index} --param layer_range={wildcards.start}:{wildcards.stop}",
            ) + " 2> {log}"

    rule faults:
        input:
            shards=lambda wc: [f"{d}/manifest.json" for d in faults_shard_dirs(wc)],
        output:
            cells=f"{RESULTS}/faults/cells.parquet",
            scorecard=f"{RESULTS}/faults/scorecard.parquet",
            detection=f"{RESULTS}/faults/detection.parquet",
            ulp=f"{RESULTS}/faults/ulp_distribution.parquet",
            manifest=f"{RESULTS}/faults/manifest.json",
        params:
            code=code_digest("faults"),
            shards=lambda wc: " ".join(f"--shard {d}" for d in faults_shard_dirs(wc)),
            env=ENVIRONMENT,
        log:
            f"{LOGS}/faults_gather.log",
        threads: 1
        resources:
            mem_mb=8000,
        shell:
            f"python -m int8alibi.stages.faults gather --config {RUN_CONFIG} "
            f"--out {RESULTS}/faults {{params.shards}} 2> {{log}}"


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
        cfg=config_digest(RUN, ["device", "exploratory"]),
        env=ENVIRONMENT,
    log:
        f"{LOGS}/faults_smoke.log",
    threads: 2
    resources:
        mem_mb=4000,
        gpu=use_gpu(RUN),
    shell:
        stage_cmd(
            "faults", f"{RESULTS}/faults_smoke", "--input operands={input.index} --param layers=2"
        ) + " 2> {log}"
