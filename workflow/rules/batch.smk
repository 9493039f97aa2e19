rule batch:
    """Batch invariance (this project's extension): each row at every M and among strangers; each prompt
    alone and inside padded batches."""
    input:
        index=rules.capture.output.index,
        capture_manifest=rules.capture.output.manifest,
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        protocol=protocol_files("batch"),
    output:
        **stage_outputs("batch"),
    log:
        f"{LOGS}/batch.log",
    benchmark:
        f"{BENCHMARKS}/batch.tsv"
    priority: rule_priority("batch")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("batch")
    resources:
        **stage_resources("batch"),
    params:
        **stage_params("batch"),
    shell:
        stage_cmd("batch", f"{RESULTS}/batch", "--input index={input.index} --input gate={input.gate}") + " 2> {log:q}"
