"""The model cache: weights materialized from S3, Hugging Face or local files onto the shared
cache volume (FSx for Lustre in production) when a version is registered, before any deploy."""
