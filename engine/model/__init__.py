"""Model code (the Llama family over a paged KV cache) and loading of Hugging Face folders."""
