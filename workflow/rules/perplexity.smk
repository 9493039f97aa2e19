rule perplexity:
    input:
        gate=rules.requant.output.gate,
        parent=rules.model.output.info,
        protocol=protocol_files("perplexity"),
    output:
        windows=f"{RESULTS}/perplexity/windows.parquet",
        summary=f"{RESULTS}/perplexity/summary.parquet",
        manifest=f"{RESULTS}/perplexity/manifest.json",
    params:
        code=code_digest("perplexity"),
        cfg=config_digest(config, ["model", "size_profile", "corpus", "device", "arms"]),
    log:
        f"{LOGS}/perplexity.log",
    benchmark:
        f"{BENCHMARKS}/perplexity.tsv"
    threads: workflow.cores
    resources:
        mem_mb=16000,
        gpu=use_gpu(config),
    shell:
        stage_cmd("perplexity", f"{RESULTS}/perplexity", "--input gate={input.gate}") + " 2> {log}"
