"""Where a run's outputs and datasets are kept: the S3 endpoint, and how the dataset's
Parquet files and key index are cut. All operational."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, SecretStr

from rsieve.settings.roles import OPERATES

# The local stack's S3 identity: refused in production (rsieve.settings.Settings).
DEV_ACCESS_KEY = "rsieve-local"
DEV_SECRET_KEY = "rsieve-local-secret"


class StorageSettings(BaseModel):
    # Object storage (any S3 endpoint; SeaweedFS locally).
    s3_endpoint: Annotated[str, OPERATES] = "http://127.0.0.1:18333"
    s3_bucket: Annotated[str, OPERATES] = "rsieve"
    s3_region: Annotated[str, OPERATES] = "us-east-1"
    s3_access_key: Annotated[SecretStr, OPERATES] = SecretStr(DEV_ACCESS_KEY)
    s3_secret_key: Annotated[SecretStr, OPERATES] = SecretStr(DEV_SECRET_KEY)
    # Dataset shards: a Parquet file of a split is closed once its data passes this size.
    parquet_shard_bytes: Annotated[int, OPERATES] = Field(256 * 1024 * 1024, ge=1024)
    # Rows buffered before they are written as one row group (bounds compaction memory).
    parquet_row_group_rows: Annotated[int, OPERATES] = Field(256, ge=1)
    # Keys per read of the dataset's key index (rsieve.compact.keyindex, 16 bytes each): with the
    # run's own keys, what one compaction holds of it, whatever the dataset's size.
    key_index_chunk_keys: Annotated[int, OPERATES] = Field(65_536, ge=1)
