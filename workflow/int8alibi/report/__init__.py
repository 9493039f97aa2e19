"""The study report: every number read from the Parquet tables, every table and figure sourced."""
