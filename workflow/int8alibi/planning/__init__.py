"""What Snakemake uses to plan a run: resolve once, rerun params, resources and floors, the run lock."""
