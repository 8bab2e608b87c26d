"""JVM options for the short-lived Spark JVMs of the tests."""

# C1 only: tiny data in a short-lived JVM, where full JIT compilation never pays off. One
# unsegmented code cache: with C1 alone, the small segment that holds adapters filled up
# once the whole suite's generated code had run in one JVM ("Out of space in CodeCache
# for adapters"), and every later Spark test failed.
QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:-SegmentedCodeCache -XX:ReservedCodeCacheSize=256m"
