rule perplexity:
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        parent=rules.model.output.info,
        model_manifest=rules.model.output.manifest,
        protocol=protocol_files("perplexity"),
    output:
        windows=update(f"{RESULTS}/perplexity/windows.parquet"),
        summary=update(f"{RESULTS}/perplexity/summary.parquet"),
        manifest=update(f"{RESULTS}/perplexity/manifest.json"),
    log:
        f"{LOGS}/perplexity.log",
    benchmark:
        f"{BENCHMARKS}/perplexity.tsv"
    priority: rule_priority("perplexity")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("perplexity")
    resources:
        mem_mb=RESOURCES["perplexity"].mem_mb,
        runtime=RESOURCES["perplexity"].runtime,
        gpu=use_gpu(RUN),
        gpu_mem_mb=RESOURCES["perplexity"].gpu_mem_mb,
    params:
        **stage_params("perplexity"),
    shell:
        stage_cmd("perplexity", f"{RESULTS}/perplexity", "--input gate={input.gate}") + " 2> {log:q}"
