rule protocol:
    input:
        protocol_files("protocol"),
    output:
        pins=f"{RESULTS}/protocol/pins.parquet",
        manifest=f"{RESULTS}/protocol/manifest.json",
    params:
        code=code_digest("protocol"),
    log:
        f"{LOGS}/protocol.log",
    threads: 1
    resources:
        mem_mb=1000,
    shell:
        stage_cmd("protocol", f"{RESULTS}/protocol") + " 2> {log}"
