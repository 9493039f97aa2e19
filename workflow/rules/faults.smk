if int(config.get("faults_shards", 1)) <= 1:

    rule faults:
        input:
            index=rules.capture.output.index,
            capture_manifest=rules.capture.output.manifest,
            protocol=protocol_files("faults"),
        output:
            **stage_outputs("faults"),
        log:
            f"{LOGS}/faults.log",
        benchmark:
            f"{BENCHMARKS}/faults.tsv"
        priority: rule_priority("faults")
        conda:
            software_env(gpu_capable=True)
        threads: stage_threads("faults")
        resources:
            **stage_resources("faults"),
        params:
            **stage_params("faults"),
        shell:
            stage_cmd("faults", f"{RESULTS}/faults", "--input operands={input.index}") + " 2> {log:q}"

else:

    # Scatter/gather for a cluster: layer ranges run as separate jobs (faults_shard_dirs in
    # common.smk), then one gather writes the campaign's tables (byte-identical to a single run: rows
    # are sorted by key on write). The gather only merges tables: it runs where snakemake runs.
    localrules:
        faults,

    rule faults_shard:
        input:
            index=rules.capture.output.index,
            capture_manifest=rules.capture.output.manifest,
            protocol=protocol_files("faults"),
        output:
            manifest=update(f"{RESULTS}/faults/shards/{{start}}_{{stop}}/manifest.json"),
        log:
            f"{LOGS}/faults/shard_{{start}}_{{stop}}.log",
        benchmark:
            f"{BENCHMARKS}/faults/shard_{{start}}_{{stop}}.tsv"
        wildcard_constraints:
            start=r"\d+",
            stop=r"\d+",
        priority: rule_priority("faults_shard")
        conda:
            software_env(gpu_capable=True)
        threads: stage_threads("faults")
        resources:
            **stage_resources("faults_shard"),
        params:
            **stage_params("faults"),
        shell:
            stage_cmd(
                "faults",
                f"{RESULTS}/faults/shards/{{wildcards.start}}_{{wildcards.stop}}",
                "--input operands={input.index} --param layer_range={wildcards.start}:{wildcards.stop}",
            )
            + " 2> {log:q}"

    rule faults:
        input:
            shards=faults_shard_manifests,
        output:
            **stage_outputs("faults"),
        log:
            f"{LOGS}/faults_gather.log",
        benchmark:
            f"{BENCHMARKS}/faults_gather.tsv"
        conda:
            software_env()
        # the gather only concatenates the shards' tables
        threads: 1
        resources:
            mem_mb=8000,
        params:
            **stage_params("faults"),
            shards=faults_shard_args,
        shell:
            f"{{params.python:q}} -m int8alibi.stages.faults gather --config {{params.run_config:q}} "
            f"--out {qpath(f'{RESULTS}/faults')} {{params.shards:q}} 2> {{log:q}}"


rule faults_smoke:
    """The disclosed smoke run: the campaign on the first two captured layers only."""
    input:
        index=rules.capture.output.index,
        capture_manifest=rules.capture.output.manifest,
        protocol=protocol_files("faults"),
    output:
        **stage_outputs("faults", folder=f"{RESULTS}/faults_smoke"),
    log:
        f"{LOGS}/faults_smoke.log",
    benchmark:
        f"{BENCHMARKS}/faults_smoke.tsv"
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("faults")
    resources:
        mem_mb=4000,
        gpu=use_gpu(RUN),
        gpu_mem_mb=RESOURCES["faults"].gpu_mem_mb,
    params:
        **stage_params("faults"),
    shell:
        stage_cmd("faults", f"{RESULTS}/faults_smoke", "--input operands={input.index} --param layers=2")
        + " 2> {log:q}"
