rule protocol:
    input:
        protocol=protocol_files("protocol"),
        # every amendment: one that only pins data still changes the pins table
        amendments=sorted(f"amendments/{p.name}" for p in (ROOT / "amendments").glob("A-*.yaml")),
    output:
        **stage_outputs("protocol"),
    log:
        f"{LOGS}/protocol.log",
    benchmark:
        f"{BENCHMARKS}/protocol.tsv"
    conda:
        software_env()
    threads: stage_threads("protocol")
    resources:
        **stage_resources("protocol"),
    params:
        **stage_params("protocol"),
    shell:
        stage_cmd("protocol", f"{RESULTS}/protocol") + " 2> {log:q}"
