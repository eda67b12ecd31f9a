"""Training recipes: tokenizer, backbone LM and Medusa heads (`python -m specdec.train`)."""
