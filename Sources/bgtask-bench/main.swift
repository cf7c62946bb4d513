BGTaskBench.main()
