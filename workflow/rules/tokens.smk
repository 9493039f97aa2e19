rule tokens:
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        parent=rules.model.output.info,
        model_manifest=rules.model.output.manifest,
        protocol=protocol_files("tokens"),
    output:
        **stage_outputs("tokens"),
    log:
        f"{LOGS}/tokens.log",
    benchmark:
        f"{BENCHMARKS}/tokens.tsv"
    priority: rule_priority("tokens")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("tokens")
    resources:
        **stage_resources("tokens"),
    params:
        **stage_params("tokens"),
    shell:
        stage_cmd("tokens", f"{RESULTS}/tokens", "--input gate={input.gate} --input parent={input.parent}")
        + " 2> {log:q}"
