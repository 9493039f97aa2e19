rule report:
    input:
        manifests=REPORT_INPUTS,
        protocol=protocol_files("report"),
    output:
        md=f"{RESULTS}/report/report.md",
        html=f"{RESULTS}/report/report.html",
        manifest=f"{RESULTS}/report/manifest.json",
    params:
        code=code_digest("report"),
    log:
        f"{LOGS}/report.log",
    threads: 1
    resources:
        mem_mb=2000,
    shell:
        stage_cmd("report", f"{RESULTS}/report", f"--input results={RESULTS}") + " 2> {log}"
