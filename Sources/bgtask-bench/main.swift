print("bgtask-bench: not written yet")
