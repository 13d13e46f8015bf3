# Shortcuts for the README's commands (make is optional; the commands need only Python 3.11).
.PHONY: run test services-start services-stop
run:
	python3.11 deploy/dev.py run
test:
	python3.11 deploy/dev.py test
services-start:
	python3.11 deploy/dev.py services start
services-stop:
	python3.11 deploy/dev.py services stop
