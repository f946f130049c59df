from workledger.cli import main

main()
