rule report:
    input:
        manifests=REPORT_INPUTS,
        protocol=protocol_files("report"),
    output:
        **stage_outputs("report", captions={"html": "report.rst"}, category="Report"),
        # the main tables, one page each, with its caption in workflow/report/<name>.rst
        **{
            name: report(
                update(f"{RESULTS}/report/{report_tables.page(name)}"),
                caption=f"../report/{name}.rst",
                category="Tables",
            )
            for name in REPORT_TABLES
        },
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
