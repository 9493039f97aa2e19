rule report:
    input:
        manifests=REPORT_INPUTS,
        protocol=protocol_files("report"),
    output:
        **deleted_with(figure=f"{RESULTS}/report/*.svg"),
        # the main tables, one page each, with its caption in workflow/report/<name>.rst
        **{
            name: report(
                update(f"{RESULTS}/report/{report_tables.page(name)}"),
                caption=f"../report/{name}.rst",
                category="Tables",
            )
            for name in REPORT_TABLES
        },
        md=update(f"{RESULTS}/report/report.md"),
        html=report(update(f"{RESULTS}/report/report.html"), caption="../report/report.rst", category="Report"),
        appendix_md=update(f"{RESULTS}/report/appendix.md"),
        appendix_html=update(f"{RESULTS}/report/appendix.html"),
        manifest=update(f"{RESULTS}/report/manifest.json"),
    log:
        f"{LOGS}/report.log",
    benchmark:
        f"{BENCHMARKS}/report.tsv"
    conda:
        software_env()
    threads: stage_threads("report")
    resources:
        mem_mb=2000,
    params:
        **stage_params("report"),
    shell:
        stage_cmd("report", f"{RESULTS}/report", f"--input results={qpath(RESULTS)}") + " 2> {log:q}"
