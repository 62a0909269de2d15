"""The PySpark data source over snapshots and the nightly job (coming with the snapshots issue).

It may import engine/format.py and engine/filenames.py only (pure, no asyncio).
"""
