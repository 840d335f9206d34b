from loghub.cli import main

main()
