# Copies of the report's figures, for Snakemake's own report (`snakemake --report report.zip`). The
# folder has no manifest, so it is no stage folder: the report's own SVGs are the ones its manifest
# lists and `int8alibi verify` checks; this copy may carry Snakemake's timestamp file.


rule report_figures:
    input:
        manifest=rules.report.output.manifest,
    output:
        figures=report(
            directory(f"{RESULTS}/figures"),
            patterns=["{name}.svg"],
            caption="../report/figures.rst",
            category="Figures",
        ),
    log:
        f"{LOGS}/report_figures.log",
    benchmark:
        f"{BENCHMARKS}/report_figures.tsv"
    conda:
        software_env()
    threads: 1
    resources:
        mem_mb=200,
    params:
        report=lambda wildcards, input: os.path.dirname(input.manifest),
    shell:
        "(mkdir -p {output.figures:q} && find {params.report:q} -maxdepth 1 -name '*.svg' "
        "-exec cp -t {output.figures:q} -- {{}} +) 2> {log:q}"
