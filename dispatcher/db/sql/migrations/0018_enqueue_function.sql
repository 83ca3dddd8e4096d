-- Enqueue from SQL: dispatcher_enqueue(job_type, payload, ...), for a trigger on an application's
-- table or a plain transaction, and dispatcher_bucket_for(key), the bucket Python gives a key.
-- A job enqueued here is the job `dispatcher.enqueue` would write with the same options: the same
-- checks (dispatcher/api/enqueue_checks.py), each refusal an error with SQLSTATE 22023 naming its
-- parameter (in the message and in the error's column field), before anything is written; the
-- same bucket for the same key, picked in the same order (_pick_bucket in dispatcher/api/enqueue.py);
-- the same INSERT as jobs_insert_one, or jobs_insert_one_keyed for an ordering key (a keyed job
-- becomes its key's holder or waits behind it); the same wake-up, sent when the caller's
-- transaction commits. NULL back when a live job holds the dedupe key, as enqueue's None.
-- Not offered: jitter_s and dedupe_window_s (docs/guides/sql-enqueue.md). Trace context: none.
--
-- SECURITY INVOKER (the default): the caller needs what a Python enqueue needs (INSERT on the
-- jobs table, its sequence), and EXECUTE, which is taken from PUBLIC here and granted to the
-- workers' role by `dispatcher grants` (dispatcher/db/privileges.py). The search_path is pinned
-- to the migrator's, where the tables are, so a trigger fired under another search_path finds
-- them. On a Citus cluster both run on the coordinator, like an application's enqueue.
--
-- One transaction: functions only, no lock on the jobs.

-- The bucket of a key: crc32 of its UTF-8 bytes modulo 64, as bucket_for in
-- dispatcher/api/enqueue.py (zlib.crc32(key.encode()) % NUM_BUCKETS), so that a key gets the
-- same bucket whichever side enqueues it. Table-driven CRC-32 (the reflected polynomial
-- 0xEDB88320, zlib's): one table lookup per byte.
CREATE OR REPLACE FUNCTION dispatcher_bucket_for(key text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    bytes constant bytea := convert_to(key, 'UTF8');
    crc bigint := 4294967295;  -- 0xFFFFFFFF
    crc_table constant bigint[] := ARRAY[
    0, 1996959894, 3993919788, 2567524794, 124634137, 1886057615, 3915621685, 2657392035,
    249268274, 2044508324, 3772115230, 2547177864, 162941995, 2125561021, 3887607047, 2428444049,
    498536548, 1789927666, 4089016648, 2227061214, 450548861, 1843258603, 4107580753, 2211677639,
    325883990, 1684777152, 4251122042, 2321926636, 335633487, 1661365465, 4195302755, 2366115317,
    997073096, 1281953886, 3579855332, 2724688242, 1006888145, 1258607687, 3524101629, 2768942443,
    901097722, 1119000684, 3686517206, 2898065728, 853044451, 1172266101, 3705015759, 2882616665,
    651767980, 1373503546, 3369554304, 3218104598, 565507253, 1454621731, 3485111705, 3099436303,
    671266974, 1594198024, 3322730930, 2970347812, 795835527, 1483230225, 3244367275, 3060149565,
    1994146192, 31158534, 2563907772, 4023717930, 1907459465, 112637215, 2680153253, 3904427059,
    2013776290, 251722036, 2517215374, 3775830040, 2137656763, 141376813, 2439277719, 3865271297,
    1802195444, 476864866, 2238001368, 4066508878, 1812370925, 453092731, 2181625025, 4111451223,
    1706088902, 314042704, 2344532202, 4240017532, 1658658271, 366619977, 2362670323, 4224994405,
    1303535960, 984961486, 2747007092, 3569037538, 1256170817, 1037604311, 2765210733, 3554079995,
    1131014506, 879679996, 2909243462, 3663771856, 1141124467, 855842277, 2852801631, 3708648649,
    1342533948, 654459306, 3188396048, 3373015174, 1466479909, 544179635, 3110523913, 3462522015,
    1591671054, 702138776, 2966460450, 3352799412, 1504918807, 783551873, 3082640443, 3233442989,
    3988292384, 2596254646, 62317068, 1957810842, 3939845945, 2647816111, 81470997, 1943803523,
    3814918930, 2489596804, 225274430, 2053790376, 3826175755, 2466906013, 167816743, 2097651377,
    4027552580, 2265490386, 503444072, 1762050814, 4150417245, 2154129355, 426522225, 1852507879,
    4275313526, 2312317920, 282753626, 1742555852, 4189708143, 2394877945, 397917763, 1622183637,
    3604390888, 2714866558, 953729732, 1340076626, 3518719985, 2797360999, 1068828381, 1219638859,
    3624741850, 2936675148, 906185462, 1090812512, 3747672003, 2825379669, 829329135, 1181335161,
    3412177804, 3160834842, 628085408, 1382605366, 3423369109, 3138078467, 570562233, 1426400815,
    3317316542, 2998733608, 733239954, 1555261956, 3268935591, 3050360625, 752459403, 1541320221,
    2607071920, 3965973030, 1969922972, 40735498, 2617837225, 3943577151, 1913087877, 83908371,
    2512341634, 3803740692, 2075208622, 213261112, 2463272603, 3855990285, 2094854071, 198958881,
    2262029012, 4057260610, 1759359992, 534414190, 2176718541, 4139329115, 1873836001, 414664567,
    2282248934, 4279200368, 1711684554, 285281116, 2405801727, 4167216745, 1634467795, 376229701,
    2685067896, 3608007406, 1308918612, 956543938, 2808555105, 3495958263, 1231636301, 1047427035,
    2932959818, 3654703836, 1088359270, 936918000, 2847714899, 3736837829, 1202900863, 817233897,
    3183342108, 3401237130, 1404277552, 615818150, 3134207493, 3453421203, 1423857449, 601450431,
    3009837614, 3294710456, 1567103746, 711928724, 3020668471, 3272380065, 1510334235, 755167117
    ];
BEGIN
    FOR i IN 0 .. octet_length(bytes) - 1 LOOP
        crc := crc_table[((crc # get_byte(bytes, i)) & 255) + 1] # (crc >> 8);
    END LOOP;
    RETURN ((crc # 4294967295) % 64)::integer;
END
$$;

-- One job, in the caller's transaction; its id, or NULL when a live job holds its dedupe key.
-- The parameters are enqueue's options, named as in Python; the bounds are enqueue_checks.py's
-- (tests/integration/test_sql_enqueue.py checks each against its Python constant). The payload
-- is bounded by the size of its jsonb text (which writes ", " and ": ", where Python counts
-- compact JSON).
CREATE OR REPLACE FUNCTION dispatcher_enqueue(
    job_type          text,
    payload           jsonb            DEFAULT NULL,
    queue             text             DEFAULT 'default',
    priority          integer          DEFAULT 0,
    run_at            timestamptz      DEFAULT NULL,
    delay_s           double precision DEFAULT 0,
    max_attempts      integer          DEFAULT NULL,
    partition_key     text             DEFAULT NULL,
    ordering_key      text             DEFAULT NULL,
    dedupe_key        text             DEFAULT NULL,
    bucket            integer          DEFAULT NULL,
    tags              text[]           DEFAULT NULL,
    max_payload_bytes bigint           DEFAULT 1048576
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    -- the parameters under names no column has, for the statements below
    v_job_type     constant text := job_type;
    v_queue        constant text := queue;
    v_run_at       constant timestamptz := run_at;
    v_delay_s      constant double precision := delay_s;
    v_max_attempts constant integer := max_attempts;
    v_dedupe_key   constant text := dedupe_key;
    v_ordering_key constant text := ordering_key;
    v_payload      jsonb := payload;
    v_priority     smallint;
    v_bucket       smallint;
    v_tags         text[] := tags;
    v_size         bigint;
    v_id           bigint;
    v_status       text;
    v_due          timestamptz;
    v_due_in_ms    bigint;
    v_bad_tag      text;
    name_pattern   constant text := '^[A-Za-z0-9_.-]{1,100}$';   -- constants.NAME_PATTERN
    tag_pattern    constant text := '^[A-Za-z0-9_.:-]{1,64}$';   -- enqueue_checks.TAG_PATTERN
BEGIN
    -- check_names
    IF v_job_type IS NULL OR v_job_type COLLATE "C" !~ name_pattern THEN
        RAISE EXCEPTION 'dispatcher_enqueue: job_type must match [A-Za-z0-9_.\-]{1,100}, got %',
            coalesce(quote_literal(left(v_job_type, 120)), 'NULL')
            USING ERRCODE = '22023', COLUMN = 'job_type';
    END IF;
    IF v_queue IS NULL OR v_queue COLLATE "C" !~ name_pattern THEN
        RAISE EXCEPTION 'dispatcher_enqueue: queue must match [A-Za-z0-9_.\-]{1,100}, got %',
            coalesce(quote_literal(left(v_queue, 120)), 'NULL')
            USING ERRCODE = '22023', COLUMN = 'queue';
    END IF;
    -- check_options
    IF priority IS NULL OR priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: priority must be in -32768..32767, got %', priority
            USING ERRCODE = '22023', COLUMN = 'priority';
    END IF;
    v_priority := priority;
    IF v_max_attempts NOT BETWEEN 1 AND 1000000 THEN  -- NULL: the handler's, else 20
        RAISE EXCEPTION 'dispatcher_enqueue: max_attempts must be in 1..1000000, got %', v_max_attempts
            USING ERRCODE = '22023', COLUMN = 'max_attempts';
    END IF;
    -- NaN sorts above every number in PostgreSQL, so it fails here as the infinities do
    IF v_delay_s IS NULL OR v_delay_s NOT BETWEEN 0 AND 3155760000 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: delay_s must be a number of seconds >= 0 and at most '
            '3155760000 (100 years), got %', v_delay_s
            USING ERRCODE = '22023', COLUMN = 'delay_s';
    END IF;
    IF v_run_at IS NOT NULL AND NOT isfinite(v_run_at) THEN
        RAISE EXCEPTION 'dispatcher_enqueue: run_at must be finite, got %', v_run_at
            USING ERRCODE = '22023', COLUMN = 'run_at';
    END IF;
    IF v_run_at IS NOT NULL AND v_delay_s <> 0 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: give run_at or delay_s, not both'
            USING ERRCODE = '22023', COLUMN = 'run_at';
    END IF;
    -- check_keys
    IF bucket IS NOT NULL AND partition_key IS NOT NULL THEN
        RAISE EXCEPTION 'dispatcher_enqueue: give bucket or partition_key, not both'
            USING ERRCODE = '22023', COLUMN = 'bucket';
    END IF;
    IF bucket NOT BETWEEN 0 AND 63 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: bucket must be in 0..63, got %', bucket
            USING ERRCODE = '22023', COLUMN = 'bucket';
    END IF;
    -- a text cannot hold a NUL: empty and too long are what is left of check_key_text
    IF char_length(v_dedupe_key) NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: dedupe_key must be 1 to 500 characters, got %',
            CASE WHEN v_dedupe_key = '' THEN 'an empty string'
                 ELSE char_length(v_dedupe_key) || ' characters' END
            USING ERRCODE = '22023', COLUMN = 'dedupe_key';
    END IF;
    IF char_length(v_ordering_key) NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: ordering_key must be 1 to 500 characters, got %',
            CASE WHEN v_ordering_key = '' THEN 'an empty string'
                 ELSE char_length(v_ordering_key) || ' characters' END
            USING ERRCODE = '22023', COLUMN = 'ordering_key';
    END IF;
    -- check_tags: each tag matches TAG_PATTERN, duplicates dropped in the order given, then at
    -- most MAX_TAGS; none is NULL
    IF array_ndims(v_tags) > 1 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: tags must be a one-dimensional array, got %', left(v_tags::text, 200)
            USING ERRCODE = '22023', COLUMN = 'tags';
    END IF;
    SELECT coalesce(quote_literal(left(t.tag, 120)), 'NULL') INTO v_bad_tag
      FROM unnest(v_tags) WITH ORDINALITY AS t(tag, n)
     WHERE (t.tag COLLATE "C" ~ tag_pattern) IS NOT TRUE
     ORDER BY t.n
     LIMIT 1;
    IF v_bad_tag IS NOT NULL THEN
        RAISE EXCEPTION 'dispatcher_enqueue: tags: each tag must match [A-Za-z0-9_.:\-]{1,64}, got %', v_bad_tag
            USING ERRCODE = '22023', COLUMN = 'tags';
    END IF;
    v_tags := ARRAY(SELECT d.tag
                      FROM (SELECT DISTINCT ON (t.tag) t.tag, t.n
                              FROM unnest(v_tags) WITH ORDINALITY AS t(tag, n)
                             ORDER BY t.tag, t.n) AS d
                     ORDER BY d.n);
    IF cardinality(v_tags) > 16 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: tags: at most 16 tags, got %', cardinality(v_tags)
            USING ERRCODE = '22023', COLUMN = 'tags';
    END IF;
    IF cardinality(v_tags) = 0 THEN
        v_tags := NULL;  -- as Python stores no tags
    END IF;
    -- serialize_payload: SQL NULL and JSON null are Python's None, stored as {}
    IF max_payload_bytes IS NULL OR max_payload_bytes NOT BETWEEN 2 AND 4611686018427387904 THEN
        RAISE EXCEPTION 'dispatcher_enqueue: max_payload_bytes must be in 2..4611686018427387904, got %',
            max_payload_bytes
            USING ERRCODE = '22023', COLUMN = 'max_payload_bytes';
    END IF;
    IF v_payload IS NULL OR v_payload = 'null'::jsonb THEN
        v_payload := '{}'::jsonb;
    END IF;
    v_size := octet_length(v_payload::text);
    IF v_size > max_payload_bytes THEN
        RAISE EXCEPTION 'dispatcher_enqueue: payload is % bytes, over the limit of % bytes',
            v_size, max_payload_bytes
            USING ERRCODE = '22023', COLUMN = 'payload';
    END IF;
    -- _pick_bucket: the ordering key, the bucket, the partition key, the dedupe key, chance
    IF v_ordering_key IS NOT NULL THEN
        v_bucket := dispatcher_bucket_for(v_ordering_key);
        IF partition_key IS NOT NULL AND dispatcher_bucket_for(partition_key) <> v_bucket THEN
            RAISE EXCEPTION 'dispatcher_enqueue: partition_key % maps to bucket % and ordering_key % '
                'to bucket %: give one of them', quote_literal(left(partition_key, 120)),
                dispatcher_bucket_for(partition_key), quote_literal(left(v_ordering_key, 120)), v_bucket
                USING ERRCODE = '22023', COLUMN = 'partition_key';
        END IF;
        IF bucket IS NOT NULL AND bucket <> v_bucket THEN
            RAISE EXCEPTION 'dispatcher_enqueue: bucket % is not ordering_key %''s bucket (%): '
                'leave bucket out', bucket, quote_literal(left(v_ordering_key, 120)), v_bucket
                USING ERRCODE = '22023', COLUMN = 'bucket';
        END IF;
    ELSIF bucket IS NOT NULL THEN
        v_bucket := bucket;
    ELSIF partition_key IS NOT NULL THEN
        v_bucket := dispatcher_bucket_for(partition_key);
    ELSIF v_dedupe_key IS NOT NULL THEN
        v_bucket := dispatcher_bucket_for(v_dedupe_key);
    ELSE
        v_bucket := floor(random() * 64);
    END IF;

    IF v_ordering_key IS NULL THEN
        -- jobs_insert_one (sql/enqueue.sql): a live duplicate makes it a no-op
        INSERT INTO dispatcher_jobs AS j (queue_name, job_type, payload, priority, bucket, max_attempts,
                                          max_attempts_given, run_at, dedupe_key, tags)
        VALUES (v_queue, v_job_type, v_payload, v_priority, v_bucket, coalesce(v_max_attempts, 20),
                v_max_attempts IS NOT NULL, coalesce(v_run_at, now()) + v_delay_s * interval '1 second',
                v_dedupe_key, v_tags)
        ON CONFLICT DO NOTHING  -- only the live dedupe index can conflict, as in jobs_insert_one
        RETURNING j.id, j.status, j.run_at INTO v_id, v_status, v_due;
    ELSE
        -- jobs_insert_one_keyed (sql/ordering.sql), and for its reasons: the key's holder if it has
        -- none and no job waits for it, else waiting behind them (and not notified)
        WITH new AS (SELECT nextval('dispatcher_jobs_id_seq') AS id),
        head AS (
            INSERT INTO dispatcher_jobs AS j (id, queue_name, job_type, payload, priority, bucket, max_attempts,
                                              max_attempts_given, run_at, dedupe_key, ordering_key, tags)
            OVERRIDING SYSTEM VALUE
            SELECT new.id, v_queue, v_job_type, v_payload, v_priority, v_bucket, coalesce(v_max_attempts, 20),
                   v_max_attempts IS NOT NULL, coalesce(v_run_at, now()) + v_delay_s * interval '1 second',
                   v_dedupe_key, v_ordering_key, v_tags
              FROM new
             WHERE NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS w  -- in the key's bucket: one shard on Citus
                                WHERE w.bucket = v_bucket AND w.queue_name = v_queue
                                  AND w.ordering_key = v_ordering_key AND w.status = 'waiting')
            ON CONFLICT DO NOTHING
            RETURNING j.id, j.status, j.run_at
        ),
        behind AS (  -- only one of head and behind inserts: they share the id
            INSERT INTO dispatcher_jobs AS j (id, queue_name, job_type, payload, priority, bucket, max_attempts,
                                              max_attempts_given, run_at, dedupe_key, ordering_key, tags, status)
            OVERRIDING SYSTEM VALUE
            SELECT new.id, v_queue, v_job_type, v_payload, v_priority, v_bucket, coalesce(v_max_attempts, 20),
                   v_max_attempts IS NOT NULL, coalesce(v_run_at, now()) + v_delay_s * interval '1 second',
                   v_dedupe_key, v_ordering_key, v_tags, 'waiting'
              FROM new
             WHERE NOT EXISTS (SELECT 1 FROM head)
            ON CONFLICT DO NOTHING  -- only the live dedupe index can conflict
            RETURNING j.id, j.status, j.run_at
        )
        SELECT i.id, i.status, i.run_at INTO v_id, v_status, v_due
          FROM (SELECT h.id, h.status, h.run_at FROM head AS h
                 UNION ALL
                SELECT b.id, b.status, b.run_at FROM behind AS b) AS i;
    END IF;

    -- The wake-up of jobs_insert_one, on its channel (NOTIFY_CHANNEL) with its payload
    -- (listener.format_payload, then ':<ms until run_at>' for a job not due yet), sent at COMMIT.
    -- A waiting job is not claimable yet: no wake-up.
    IF v_status = 'queued' THEN
        v_due_in_ms := ceil(1000 * extract(epoch FROM v_due - clock_timestamp()));
        PERFORM pg_notify('dispatcher_jobs', v_queue || ':' || v_bucket
                                             || CASE WHEN v_due_in_ms > 0 THEN ':' || v_due_in_ms ELSE '' END);
    END IF;
    RETURN v_id;
END
$$;

-- EXECUTE is granted to PUBLIC by default: here, only to the roles `dispatcher grants` names.
REVOKE EXECUTE ON FUNCTION dispatcher_bucket_for(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION dispatcher_enqueue(text, jsonb, text, integer, timestamptz, double precision, integer,
                                              text, text, text, integer, text[], bigint) FROM PUBLIC;
