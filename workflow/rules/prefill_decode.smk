rule prefill_decode:
    """Same arm, prefill versus decode: token flips and the first module whose bits differ."""
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        protocol=protocol_files("prefill_decode"),
    output:
        **stage_outputs("prefill_decode"),
    log:
        f"{LOGS}/prefill_decode.log",
    benchmark:
        f"{BENCHMARKS}/prefill_decode.tsv"
    priority: rule_priority("prefill_decode")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("prefill_decode")
    resources:
        **stage_resources("prefill_decode"),
    params:
        **stage_params("prefill_decode"),
    shell:
        stage_cmd("prefill_decode", f"{RESULTS}/prefill_decode", "--input gate={input.gate}") + " 2> {log:q}"
