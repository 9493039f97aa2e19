rule prefill_decode:
    """Same arm, prefill versus decode: token flips and the first module whose bits differ."""
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        protocol=protocol_files("prefill_decode"),
    output:
        prefill_decode=update(f"{RESULTS}/prefill_decode/prefill_decode.parquet"),
        first_divergence=update(f"{RESULTS}/prefill_decode/first_divergence.parquet"),
        manifest=update(f"{RESULTS}/prefill_decode/manifest.json"),
    log:
        f"{LOGS}/prefill_decode.log",
    benchmark:
        f"{BENCHMARKS}/prefill_decode.tsv"
    priority: rule_priority("prefill_decode")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("prefill_decode")
    resources:
        mem_mb=RESOURCES["prefill_decode"].mem_mb,
        runtime=RESOURCES["prefill_decode"].runtime,
        gpu=use_gpu(RUN),
        gpu_mem_mb=RESOURCES["prefill_decode"].gpu_mem_mb,
    params:
        **stage_params("prefill_decode"),
    shell:
        stage_cmd("prefill_decode", f"{RESULTS}/prefill_decode", "--input gate={input.gate}") + " 2> {log:q}"
