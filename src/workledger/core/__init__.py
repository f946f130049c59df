"""The pure core: states, transitions, retry decisions and run-state derivation.

Nothing in this package performs I/O, reads a clock or draws a random number; callers pass
those in. That is what lets the rules be tested exhaustively without a database.
"""
