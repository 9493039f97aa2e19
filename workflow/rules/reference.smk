# llm-compressor's own W8A8 of the parent: the requant gate's independent reference. Only in the DAG
# when the config names no committed checkpoint (model.checkpoint), which is the reference otherwise.
# The job runs in llm-compressor's environment, not Snakemake's: its virtualenv (./bootstrap), or
# under --sdm conda workflow/envs/llmcompressor.yaml. The checkpoint folder beside the manifest is listed and
# hashed by the manifest, declared only for --delete-all-output (deleted_with in common.smk).
rule reference_checkpoint:
    input:
        parent=rules.model.output.info,
        # the upstream manifest too (every rule that reads another stage's outputs names it): a rerun
        # that rewrote it but left the tables' bytes as they were (Snakemake skips such an input) must
        # rerun this stage, whose manifest records that manifest's digest
        model_manifest=rules.model.output.manifest,
    output:
        **stage_outputs("reference"),
    log:
        f"{LOGS}/reference.log",
    benchmark:
        f"{BENCHMARKS}/reference.tsv"
    conda:
        "../envs/llmcompressor.yaml"
    threads: stage_threads("reference")
    resources:
        **stage_resources("reference_checkpoint"),
    params:
        # the environment it runs in is llm-compressor's lock, not the one Snakemake runs in
        **stage_params("reference", environment=lock_param()),
    shell:
        stage_cmd(
            "reference",
            f"{RESULTS}/reference",
            "--input parent={input.parent}",
            python=llmcompressor_python(CONDA),
        )
        + " 2> {log:q}"
