DB=$1
P="psql -U postgres -h 127.0.0.1 -d $DB -Atq"
$P -c "truncate postpone_jobs" -c "insert into postpone_jobs(queue,task,args) select 'default','t','{}' from generate_series(1,1000)" -c "select count(*) from postpone_claim_jobs(1, 1000, NULL, NULL)" >/dev/null
$P <<'SQL'
begin;
select clock_timestamp() as t0 \gset
select count(*) from postpone_finish(ARRAY(select id from postpone_jobs where status='doing' order by id), array_fill(1::bigint, ARRAY[1000]), ARRAY(select attempts from postpone_jobs where status='doing' order by id), array_fill('succeeded'::text, ARRAY[1000]), array_fill(NULL::text, ARRAY[1000]), array_fill(NULL::jsonb, ARRAY[1000])) \gset
select round(extract(epoch from clock_timestamp() - :'t0'::timestamptz)*1000, 2);
rollback;
SQL
