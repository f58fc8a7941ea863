#!/usr/bin/env bash
# Submit a kspout job to a Spark cluster with spark-submit: ship kspout and its dependencies
# (an archived virtualenv), ship the topic file, and run `kspout run` there (deploy/job.py).
#
# Why an archived environment and not --py-files: kspout depends on packages with C extensions
# (confluent-kafka and its librdkafka, hiredis, pydantic-core, psycopg's binary build), and
# --py-files only ships .py files, zips and eggs, which Python cannot load compiled modules
# from. Spark's "Python Package Management" guide gives the answer for that case: pack a
# virtualenv with venv-pack (or conda-pack), ship it with --archives ...#environment, and point
# spark.pyspark.python at ./environment/bin/python. --py-files stays the way to add a handler's
# own pure-Python modules. venv-pack does not pack the interpreter itself (its venv links to
# it), so every node needs the same Python at the same path as the venv's base interpreter;
# deploy/compose/Dockerfile gives the workers exactly that. docs/cluster.md says more.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

usage() {
    cat <<'EOF'
Usage: deploy/spark-submit.sh --config TOPIC.toml --handler MODULE:ATTR [options] [-- RUN OPTIONS]

Submits deploy/job.py (`kspout run` under spark-submit) with kspout, its dependencies and the
topic file shipped to the cluster. RUN OPTIONS after `--` go to `kspout run`, e.g.
--until-caught-up, --max-batches N, --replay-past-window, --json.

Options:
  --master URL          spark://host:7077, k8s://https://host:443, yarn, local[N]
                        (default: $SPARK_MASTER, else local[2])
  --config FILE         the topic file (required); shipped with --files
  --handler MODULE:ATTR what `kspout run --handler` takes: a function, a bolt or a list (required)
  --deploy-mode MODE    client (default: the driver runs here) or cluster
  --name NAME           the application's name (default: kspout-<topic file name>)
  --venv DIR            a virtualenv holding kspout and the handler's dependencies: packed
                        with venv-pack and shipped, and (client mode) the driver's Python
  --archive FILE        ship this venv-pack or conda-pack archive of --venv as it is
  --python PATH         ship no environment: every node has kspout under this interpreter
                        (an image built with it, as deploy/k8s does)
  --package SPEC        what pip installs into the virtualenv this script builds when neither
                        --venv nor --python is given (default: this checkout, with [sql])
  --with REQUIREMENT    one more pip requirement for that virtualenv; repeatable
  --base-python PATH    the interpreter that virtualenv is made from (default: python3); the
                        executors need the same one at the same path
  --work-dir DIR        where the virtualenv and the archive are built
                        (default: ${XDG_CACHE_HOME:-~/.cache}/kspout-submit)
  --py-files LIST       comma-separated .py/.zip files: the handler's own pure-Python code
  --files LIST          more files (comma-separated) for the driver's and executors' directories
  --conf KEY=VALUE      a Spark setting, after this script's own; repeatable
  --spark-submit PATH   spark-submit to run (default: $SPARK_HOME/bin/spark-submit, else PATH)
  --dry-run             print the spark-submit command, build and run nothing
  -h, --help            show this help

Environment: KSPOUT_BROKERS, KSPOUT_ZOOKEEPER and KSPOUT_REDIS_URL override the topic file's
connection settings; they are read where the driver runs (client mode: here).
EOF
}

die() {
    echo "spark-submit.sh: $*" >&2
    exit 2
}

need_value() {
    if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value (see --help)"; fi
}

master=${SPARK_MASTER:-local[2]}
deploy_mode=client
config=""
handler=""
name=""
venv=""
archive=""
python=""
package="${repo}[sql]"
base_python=python3
work_dir=${XDG_CACHE_HOME:-$HOME/.cache}/kspout-submit
py_files=""
files=""
spark_submit=""
dry_run=false
with=()
confs=()
run_args=()

while [ $# -gt 0 ]; do
    case "$1" in
        --master) need_value "$@"; master=$2; shift 2 ;;
        --config) need_value "$@"; config=$2; shift 2 ;;
        --handler) need_value "$@"; handler=$2; shift 2 ;;
        --deploy-mode) need_value "$@"; deploy_mode=$2; shift 2 ;;
        --name) need_value "$@"; name=$2; shift 2 ;;
        --venv) need_value "$@"; venv=$2; shift 2 ;;
        --archive) need_value "$@"; archive=$2; shift 2 ;;
        --python) need_value "$@"; python=$2; shift 2 ;;
        --package) need_value "$@"; package=$2; shift 2 ;;
        --with) need_value "$@"; with+=("$2"); shift 2 ;;
        --base-python) need_value "$@"; base_python=$2; shift 2 ;;
        --work-dir) need_value "$@"; work_dir=$2; shift 2 ;;
        --py-files) need_value "$@"; py_files=$2; shift 2 ;;
        --files) need_value "$@"; files=$2; shift 2 ;;
        --conf)
            need_value "$@"
            [[ $2 == *=* ]] || die "--conf takes KEY=VALUE, got '$2'"
            confs+=("$2"); shift 2 ;;
        --spark-submit) need_value "$@"; spark_submit=$2; shift 2 ;;
        --dry-run) dry_run=true; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; run_args=("$@"); break ;;
        *) die "unknown option '$1' (see --help; options for \`kspout run\` go after --)" ;;
    esac
done

[ -n "$config" ] || die "--config is required (the topic file)"
[ -n "$handler" ] || die "--handler is required (MODULE:ATTR)"
[[ $handler == ?*:?* ]] || die "--handler takes MODULE:ATTR, got '$handler'"
[ -f "$config" ] || die "--config: no file '$config'"
case "$deploy_mode" in client | cluster) ;; *) die "--deploy-mode is client or cluster" ;; esac
if [ -n "$python" ] && { [ -n "$venv" ] || [ -n "$archive" ]; }; then
    die "--python ships no environment: give it without --venv/--archive"
fi
if [ -n "$archive" ] && [ -z "$venv" ] && [ "$deploy_mode" = client ]; then
    die "--archive in client mode needs --venv too: the driver runs here, with that venv's Python"
fi
for arg in ${run_args[@]+"${run_args[@]}"}; do
    case "$arg" in
        --spark | --spark=*) die "give the master with --master, not --spark after --" ;;
        --config | --config=* | --handler | --handler=*) die "give $arg before --" ;;
    esac
done

config_abs=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
[ -n "$name" ] || name="kspout-$(basename "$config" .toml)"
if [ -z "$spark_submit" ]; then
    spark_submit=spark-submit
    [ -z "${SPARK_HOME:-}" ] || spark_submit=$SPARK_HOME/bin/spark-submit
fi
local_master=false
[[ $master == local* ]] && local_master=true

# -- the Python environment the driver and the executors run ------------------------------------
build_venv=false
if [ -z "$python" ] && [ -z "$venv" ]; then
    venv=$work_dir/venv
    build_venv=true
fi
if [ -n "$python" ]; then
    worker_python=$python
    driver_python=$python
else
    driver_python=$venv/bin/python
    if $local_master; then
        worker_python=$driver_python # local[N]: the Python workers run here, beside the driver
    else
        [ -n "$archive" ] || archive=$work_dir/kspout-env.tar.gz
        worker_python=./environment/bin/python # where --archives ...#environment unpacks it
    fi
fi

if $build_venv; then
    if $dry_run; then
        echo "# would build $venv: $base_python -m venv;" \
            "pip install $package ${with[*]-} venv-pack" >&2
    else
        echo "spark-submit.sh: building $venv from $package" >&2
        mkdir -p "$work_dir"
        "$base_python" -m venv --clear "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet "$package" ${with[@]+"${with[@]}"} venv-pack
    fi
fi
if [ -n "$venv" ] && ! $dry_run; then
    "$venv/bin/python" -c 'import kspout' 2>/dev/null \
        || die "--venv $venv: $venv/bin/python cannot import kspout (pip install kspout into it)"
fi
if [ -n "$archive" ] && [ "$archive" = "$work_dir/kspout-env.tar.gz" ]; then
    # pyspark comes from the cluster's Spark (its python/lib/pyspark.zip comes first on the
    # workers' PYTHONPATH): a copy in the venv would only add ~490 MB (unpacked) to every
    # executor's fetch.
    pack=("$venv/bin/venv-pack" --prefix "$venv" --output "$archive" --force --quiet
        --exclude 'lib/python*/site-packages/pyspark/*'
        --exclude 'lib/python*/site-packages/pyspark-*')
    if $dry_run; then
        echo "# would pack: ${pack[*]}" >&2
    else
        [ -x "$venv/bin/venv-pack" ] \
            || die "--venv $venv has no venv-pack: pip install venv-pack into it, or give --archive"
        mkdir -p "$work_dir"
        echo "spark-submit.sh: packing $venv into $archive" >&2
        "${pack[@]}"
    fi
fi
if [ -n "$archive" ] && ! $dry_run; then
    [ -f "$archive" ] || die "--archive: no file '$archive'"
fi

# -- the command ----------------------------------------------------------------------------------
cmd=("$spark_submit" --master "$master" --deploy-mode "$deploy_mode" --name "$name")
cmd+=(--files "$config_abs${files:+,$files}")
[ -z "$archive" ] || cmd+=(--archives "$archive#environment")
[ -z "$py_files" ] || cmd+=(--py-files "$py_files")
cmd+=(--conf "spark.pyspark.python=$worker_python")
if [ "$deploy_mode" = client ]; then
    # Checked before spark.pyspark.python for the driver: it runs here, not in ./environment.
    cmd+=(--conf "spark.pyspark.driver.python=$driver_python")
    job_config=$config_abs
else
    job_config=$(basename "$config") # the copy --files puts in the driver's working directory
fi
for conf in ${confs[@]+"${confs[@]}"}; do cmd+=(--conf "$conf"); done
cmd+=("$here/job.py" --config "$job_config" --handler "$handler")
cmd+=(${run_args[@]+"${run_args[@]}"})

if $dry_run; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
{ printf '+ '; printf '%q ' "${cmd[@]}"; echo; } >&2
exec "${cmd[@]}"
