from tasks.text2sql.cli import main

main()
