rule perplexity:
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        parent=rules.model.output.info,
        model_manifest=rules.model.output.manifest,
        protocol=protocol_files("perplexity"),
    output:
        **stage_outputs("perplexity"),
    log:
        f"{LOGS}/perplexity.log",
    benchmark:
        f"{BENCHMARKS}/perplexity.tsv"
    priority: rule_priority("perplexity")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("perplexity")
    resources:
        **stage_resources("perplexity"),
    params:
        **stage_params("perplexity"),
    shell:
        stage_cmd("perplexity", f"{RESULTS}/perplexity", "--input gate={input.gate}") + " 2> {log:q}"
