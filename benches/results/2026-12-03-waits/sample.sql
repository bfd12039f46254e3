\pset format unaligned
\pset tuples_only on
\pset fieldsep ','
select to_char(clock_timestamp(),'HH24:MI:SS.MS'), backend_type, coalesce(wait_event_type,'-'), coalesce(wait_event,'CPU'), left(regexp_replace(query,'\s+',' ','g'),50) from pg_stat_activity where state in ('active','idle in transaction') and pid<>pg_backend_pid() and coalesce(wait_event,'') not in ('ClientRead') \watch 0.02
