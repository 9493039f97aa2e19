rule report:
    input:
        manifests=REPORT_INPUTS,
        protocol=protocol_files("report"),
    output:
        md=update(f"{RESULTS}/report/report.md"),
        html=report(update(f"{RESULTS}/report/report.html"), caption="../report/report.rst", category="Report"),
        appendix_md=update(f"{RESULTS}/report/appendix.md"),
        appendix_html=update(f"{RESULTS}/report/appendix.html"),
        manifest=update(f"{RESULTS}/report/manifest.json"),
        **deleted_with(figure=f"{RESULTS}/report/*.svg"),
    params:
        **stage_params("report", ["model", "size_profile", "arms", "device"]),
    log:
        f"{LOGS}/report.log",
    benchmark:
        f"{BENCHMARKS}/report.tsv"
    threads: 1
    resources:
        mem_mb=2000,
    conda:
        software_env()
    shell:
        stage_cmd("report", f"{RESULTS}/report", f"--input results={qpath(RESULTS)}") + " 2> {log:q}"
