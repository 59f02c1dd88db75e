#!/usr/bin/env bash
# Start the local PostgreSQL and MariaDB servers the tests use, when they are down.
# (This machine kind runs both on 127.0.0.1 with trust auth / passwordless root; the commands
# below are the ones the machine itself starts them with.) Idempotent.
set -u

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
my_up() { mariadb-admin -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1 || mysqladmin -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1; }

if command -v pg_ctlcluster >/dev/null 2>&1 && ! pg_up; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
if [ -x /usr/sbin/mariadbd ] && ! my_up; then
  echo "services: starting MariaDB"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
fi

for _ in $(seq 1 60); do
  ok=1
  if command -v pg_ctlcluster >/dev/null 2>&1; then pg_up || ok=0; fi
  if [ -x /usr/sbin/mariadbd ]; then my_up || ok=0; fi
  [ $ok = 1 ] && break
  sleep 1
done
pg_up && echo "services: PostgreSQL up" || echo "services: PostgreSQL NOT reachable"
my_up && echo "services: MariaDB up" || echo "services: MariaDB NOT reachable"
# The tests' databases.
if pg_up; then psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" 2>/dev/null | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE test" >/dev/null 2>&1 || true; fi
if my_up; then mariadb -h 127.0.0.1 -P 3306 -uroot -e "CREATE DATABASE IF NOT EXISTS test" 2>/dev/null || true; fi
exit 0
