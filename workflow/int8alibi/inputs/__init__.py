"""The pinned text inputs: the corpus, its windows and prompts, capture's token selection."""
