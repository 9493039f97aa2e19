rule report:
    input:
        manifests=REPORT_INPUTS,
        protocol=protocol_files("report"),
    output:
        **stage_outputs("report", captions={"html": "report.rst"}, category="Report", extra=table_pages()),
    log:
        f"{LOGS}/report.log",
    benchmark:
        f"{BENCHMARKS}/report.tsv"
    conda:
        software_env()
    threads: stage_threads("report")
    resources:
        **stage_resources("report"),
    params:
        **stage_params("report"),
    shell:
        stage_cmd("report", f"{RESULTS}/report", f"--input results={qpath(RESULTS)}") + " 2> {log:q}"
