rule protocol:
    input:
        protocol=protocol_files("protocol"),
        # every amendment: one that only pins data still changes the pins table
        amendments=sorted(f"amendments/{p.name}" for p in (ROOT / "amendments").glob("A-*.yaml")),
    output:
        pins=update(f"{RESULTS}/protocol/pins.parquet"),
        manifest=update(f"{RESULTS}/protocol/manifest.json"),
    log:
        f"{LOGS}/protocol.log",
    benchmark:
        f"{BENCHMARKS}/protocol.tsv"
    conda:
        software_env()
    threads: stage_threads("protocol")
    resources:
        mem_mb=1000,
    params:
        **stage_params("protocol"),
    shell:
        stage_cmd("protocol", f"{RESULTS}/protocol") + " 2> {log:q}"
