# The cross-model view: finished results folders of several configs in one table (paper layout).
# Each folder is written by its own config: the default run's `results`, the others' `results/<name>`
# (`--config results=results/<name>`); name them with
#   snakemake crossmodel --config 'crossmodel=[results,results/qwen3-8b,results/qwen3-14b]'
# A folder that is not a finished run, or does not verify, stops the job, naming it; the view's own
# folder (`results/crossmodel`, inside the default run) is left out of that run's verification.


rule crossmodel:
    input:
        reports=crossmodel_reports,
        protocol=protocol_files("crossmodel"),
    output:
        **stage_outputs("crossmodel"),
    log:
        f"{LOGS}/crossmodel.log",
    benchmark:
        f"{BENCHMARKS}/crossmodel.tsv"
    conda:
        software_env()
    threads: stage_threads("crossmodel")
    resources:
        **stage_resources("crossmodel"),
    params:
        **stage_params("crossmodel"),
        runs=",".join(config.get("crossmodel", [])),
    shell:
        stage_cmd("crossmodel", f"{RESULTS}/crossmodel", "--param runs={params.runs}") + " 2> {log:q}"
