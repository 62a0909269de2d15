"""Background workers over the engine: the retention deleter and the key-based compactor.

    retention.py   which old segments of a partition go (a pure planner) and one pass
    offset_map.py  the compactor's fixed-size key -> offset map (numpy, open addressing)
    cleaner.py     one compaction pass over a partition's files (runs in a worker process)
    compactor.py   dirty ratios, and swapping a pass's segments into the live log
    manager.py     the two loops the app's lifespan starts, on-demand passes, figures
"""
