
-- outboxrelay.emit: the producer for any language. It checks what the Go
-- library (the outbox module) checks, raising one clear error (SQLSTATE
-- 22023, invalid_parameter_value) and writing nothing, and then writes the
-- outbox row, or, when the setting outboxrelay.emit_mode is 'message'
-- (ALTER DATABASE ... SET, or SET in the session), a table-less logical
-- decoding message with the prefix outboxrelay.message_prefix (default
-- outboxrelay). It returns the message id.
CREATE OR REPLACE FUNCTION outboxrelay.emit(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    headers        jsonb DEFAULT '{}',
    traceparent    text  DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql
AS $outboxrelay$
DECLARE
    reserved_names    text[] := {{.ReservedNames}};
    reserved_prefixes text[] := {{.ReservedPrefixes}};
    k  text;
    p  text;
    new_id uuid;
BEGIN
    IF coalesce(emit.aggregate_type, '') = '' OR coalesce(emit.aggregate_id, '') = '' OR coalesce(emit.event_type, '') = '' THEN
        RAISE EXCEPTION 'outboxrelay.emit: aggregate_type, aggregate_id and event_type must be non-empty text'
            USING ERRCODE = '22023';
    END IF;
    IF emit.headers IS NULL OR jsonb_typeof(emit.headers) = 'null' THEN
        emit.headers := '{}';
    ELSIF jsonb_typeof(emit.headers) <> 'object' THEN
        RAISE EXCEPTION 'outboxrelay.emit: headers must be a JSON object, not %', jsonb_typeof(emit.headers)
            USING ERRCODE = '22023';
    END IF;
    FOR k IN SELECT jsonb_object_keys(emit.headers) ORDER BY 1 LOOP
        IF lower(k) = ANY (reserved_names) THEN
            RAISE EXCEPTION 'outboxrelay.emit: header "%" is a name the relay sets itself (it would drop the header); rename it, for example to x-%', k, k
                USING ERRCODE = '22023';
        END IF;
        FOREACH p IN ARRAY reserved_prefixes LOOP
            IF left(lower(k), length(p)) = p THEN
                RAISE EXCEPTION 'outboxrelay.emit: header "%" starts with %, a prefix the relay sets itself (it would drop the header); rename it', k, p
                    USING ERRCODE = '22023';
            END IF;
        END LOOP;
    END LOOP;
    IF emit.traceparent = '' THEN
        emit.traceparent := NULL;
    END IF;
    -- W3C trace context: lowercase hex, version not ff, version 00 exactly
    -- 55 characters, a later one followed by '-' and printable ASCII, trace
    -- id and parent id not all zeros (as the relay reads it).
    IF emit.traceparent IS NOT NULL AND NOT (
        emit.traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[ -~]*)?$'
        AND left(emit.traceparent, 2) <> 'ff'
        AND (left(emit.traceparent, 2) <> '00' OR length(emit.traceparent) = 55)
        AND substr(emit.traceparent, 4, 32) <> repeat('0', 32)
        AND substr(emit.traceparent, 37, 16) <> repeat('0', 16)) THEN
        RAISE EXCEPTION 'outboxrelay.emit: traceparent "%" is not a W3C traceparent (00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>, lowercase, ids not all zeros)', emit.traceparent
            USING ERRCODE = '22023';
    END IF;
    IF current_setting('outboxrelay.emit_mode', true) = 'message' THEN
        new_id := gen_random_uuid();
        PERFORM pg_logical_emit_message(true,
            coalesce(nullif(current_setting('outboxrelay.message_prefix', true), ''), 'outboxrelay'),
            jsonb_build_object('id', new_id, 'aggregate_type', emit.aggregate_type, 'aggregate_id', emit.aggregate_id,
                'event_type', emit.event_type, 'payload', emit.payload, 'headers', emit.headers,
                'traceparent', emit.traceparent)::text);
        RETURN new_id;
    END IF;
    {{.EmitInsert}}
    RETURN new_id;
END
$outboxrelay$;
