#!/usr/bin/env bash
# Makes sure the servers the mesh's tests talk to are installed and running on this machine:
# PostgreSQL (127.0.0.1:5432), NATS with JetStream (127.0.0.1:4222) and RabbitMQ (127.0.0.1:5672, with its
# management API on 15672). Installs a missing one from Debian's packages and starts a stopped one. Also installs
# systemd-analyze, with which the tests check the mesh's systemd units (nothing here boots systemd).
set -euo pipefail

say() { printf 'services: %s\n' "$*"; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  local port=$1 what=$2 i
  for i in $(seq 1 120); do
    if listening "$port"; then return 0; fi
    sleep 0.5
  done
  say "$what did not open port $port"
  return 1
}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  say "installing $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# PostgreSQL
if ! command -v pg_ctlcluster >/dev/null; then install postgresql; fi
if ! listening 5432; then
  say "starting PostgreSQL"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start
  wait_port 5432 PostgreSQL
fi
if ! psql -h 127.0.0.1 -U postgres -d test -c 'select 1' >/dev/null 2>&1; then
  # A fresh Debian cluster asks for passwords on TCP; the tests expect trust on loopback and a database "test".
  say "setting PostgreSQL up for local tests"
  hba=$(as_root su postgres -c "psql -tAc 'show hba_file'")
  as_root sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main reload
  as_root su postgres -c "psql -tAc \"select 1 from pg_database where datname='test'\"" | grep -q 1 ||
    as_root su postgres -c "createdb test"
fi

# NATS with JetStream
if ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ]; then install nats-server; fi
if ! listening 4222; then
  say "starting nats-server"
  as_root mkdir -p /var/lib/nats-server
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port 4222 nats-server
fi

# RabbitMQ and its management API
if ! command -v rabbitmq-server >/dev/null; then install rabbitmq-server; fi
if ! listening 5672; then
  say "starting RabbitMQ"
  as_root rabbitmq-server -detached
  wait_port 5672 RabbitMQ
fi
if ! listening 15672; then
  say "enabling the RabbitMQ management plugin"
  as_root rabbitmq-plugins enable rabbitmq_management >/dev/null
  wait_port 15672 "RabbitMQ management"
fi
# systemd-analyze (Debian's systemd package), for `systemd-analyze verify` of the units `mesh install` writes
if ! command -v systemd-analyze >/dev/null; then install systemd; fi

say "PostgreSQL, NATS and RabbitMQ are running"
