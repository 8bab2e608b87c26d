# bench/lib.sh: helpers the benchmark scripts source (bash).

wait_port() {  # PORT TIMEOUT_S PID: until 127.0.0.1:PORT accepts; fails if PID exits first
  local port=$1 t=$2 pid=$3 i
  for ((i = 0; i < t * 10; i++)); do
    (echo > "/dev/tcp/127.0.0.1/$port") 2> /dev/null && return 0
    kill -0 "$pid" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}

amqpbroker_port() {  # DATA_DIR PID LOG: print the AMQP port from DATA_DIR/ports.json
  # Waits up to 20 s for the broker to write it; fails, with the log's tail, if the
  # broker exits first or never writes it.
  local data=$1 pid=$2 log=$3 i port
  for ((i = 0; i < 200; i++)); do
    if [ -s "$data/ports.json" ] &&
       port=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["amqp"]))' \
              "$data/ports.json" 2> /dev/null); then
      echo "$port"
      return 0
    fi
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  echo "amqpbroker (pid $pid) wrote no $data/ports.json with key amqp; the end of $log:" >&2
  tail -20 "$log" >&2
  return 1
}
