rule protocol:
    input:
        protocol=protocol_files("protocol"),
        # every amendment: one that only pins data still changes the pins table
        amendments=sorted(f"amendments/{p.name}" for p in (ROOT / "amendments").glob("A-*.yaml")),
    output:
        pins=update(f"{RESULTS}/protocol/pins.parquet"),
        manifest=update(f"{RESULTS}/protocol/manifest.json"),
    params:
        **stage_params("protocol"),
    log:
        f"{LOGS}/protocol.log",
    benchmark:
        f"{BENCHMARKS}/protocol.tsv"
    threads: 1
    resources:
        mem_mb=1000,
    conda:
        software_env()
    shell:
        stage_cmd("protocol", f"{RESULTS}/protocol") + " 2> {log:q}"
