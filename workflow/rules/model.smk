rule model:
    # The saved bf16 parent lives in results/model/parent/, declared only for --delete-all-output
    # (deleted_with in common.smk says why): parent.parquet lists and hashes every file in it, and
    # readers refuse a folder that differs. The source files are a content digest
    # param, not inputs: their timestamps change when a venv is rebuilt or a checkout copied.
    output:
        **stage_outputs("model"),
    log:
        f"{LOGS}/model.log",
    benchmark:
        f"{BENCHMARKS}/model.tsv"
    conda:
        software_env()
    threads: stage_threads("model")
    resources:
        **stage_resources("model"),
    params:
        # the source files by name, size and content (the GGUF in its package, or every file of the
        # Hugging Face directory): changing one reruns model and everything after it
        **stage_params("model"),
    shell:
        stage_cmd("model", f"{RESULTS}/model") + " 2> {log:q}"
