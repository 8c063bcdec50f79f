from nopelab.cli import main

main()
