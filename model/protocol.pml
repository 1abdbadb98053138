/*
 * The record protocol of django-idempotency, for the Spin model checker.
 *
 * One key, one record row, CLIENTS concurrent duplicates of one request, each of
 * which retries after a crash, a lost response, a 409 or an error. Beside them run
 * the clock (leases and retention windows run out), the purge, and in lease mode
 * recovery and one operator. Every write to the row's status goes through go(), which
 * asserts the move is in the table below: the model can make no move the code's
 * table (idempotency/protocol/states.py) does not have.
 *
 *   spin -a [-DATOMIC] [-DFLAW_...] model/protocol.pml    (scripts/model-check.sh runs them all)
 *
 * Modes: lease mode by default; -DATOMIC for atomic mode (claim, effect and finish in
 * one database transaction); -DATOMIC -DWRITE_ONCE for atomic mode with IN_FLIGHT "run"
 * (the work first, then the finished record inserted once, in the same transaction; a
 * key held otherwise than by a live outcome falls back to the claim).
 *
 * Axioms: what the database guarantees, taken as given, not modelled further.
 *  A1 unique index: at most one row per (scope, idem_key). An INSERT that meets another
 *     transaction's uncommitted row for the key waits for that transaction to end; here
 *     that row's entry is `lock`, held by the inserting transaction.
 *  A2 row locks: SELECT ... FOR UPDATE and every UPDATE/DELETE of the row wait while
 *     another transaction holds its lock (`lock != 0`); SKIP LOCKED passes over it
 *     instead. A statement that waited re-reads the row before writing (READ
 *     COMMITTED's re-check), so a conditional UPDATE's WHERE is judged on the row as
 *     committed when it runs: one atomic step here.
 *  A3 READ COMMITTED: a transaction's writes are invisible to others until it commits.
 *     In atomic mode the claim, the effect and the finish are kept in the attempt's
 *     locals and published at COMMIT.
 *  A4 commit atomicity: a COMMIT publishes all of a transaction's writes at once (one
 *     atomic step); a crash before it leaves none of them (rollback).
 *  A5 one clock: leases and expiry are judged by the database's clock (the `clock`
 *     process), never by the workers'.
 * Assumptions about the application (see docs/trust.md):
 *  B1 the resolver and the operator tell the truth about the effect: "done" only if it
 *     happened (and with its outcome), "not done" only if it did not; "unknown" is always
 *     allowed.
 *  B2 lease mode: the work renews its lease before its external effect, and that step
 *     ends before the renewed lease runs out (`stepping` keeps the lease from expiring in
 *     between). A pause longer than a lease in that step is outside the model; the
 *     effect carrying the key (the docs' recipe) is what guards it.
 *  B3 work that raises made no effect before it raised; an effect followed by a crash
 *     is modelled (as a crash).
 *
 * Bounds (quote them with the results): CLIENTS (3) duplicates; the first retries RETRIES
 * (1) time after a crash, a lost response, a 409 or an error (in atomic mode every client
 * does); each crashes at most CRASHES (1) times, at any step; EXPIRIES (1) retention window
 * runs out; MAX_RESOLVE (2) resolver attempts before NEEDS_REVIEW; one operator action,
 * which may never come. The liveness run (-DLIVENESS) takes 2 duplicates and no expiry.
 */

#ifndef CLIENTS
#define CLIENTS 3
#endif
#ifndef RETRIES
#define RETRIES 1
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef EXPIRIES
#define EXPIRIES 1
#endif
#define MAX_RESOLVE 2

/* The record's states; ABSENT is "no row". */
mtype:state = { ABSENT, PROCESSING, SUCCEEDED, FAILED_RETRYABLE, FAILED_FINAL, NEEDS_REVIEW };

/*
 * The moves: the states each leaves (SRC_) and reaches (DST_). This block is the
 * table tests/unit/protocol/test_model.py compares with the code's MOVES.
 */
#define B(s) (1 << (s))
#define PURGEABLE (B(SUCCEEDED) | B(FAILED_FINAL) | B(FAILED_RETRYABLE))

#define SRC_claim    (B(ABSENT))
#define DST_claim    (B(PROCESSING))
#define SRC_write_once (B(ABSENT))
#define DST_write_once (B(SUCCEEDED) | B(FAILED_FINAL))
#define SRC_retry    (B(FAILED_RETRYABLE))
#define DST_retry    (B(PROCESSING))
#define SRC_replace  (B(SUCCEEDED) | B(FAILED_FINAL) | B(FAILED_RETRYABLE))
#define DST_replace  (B(PROCESSING))
#define SRC_renew    (B(PROCESSING))
#define DST_renew    (B(PROCESSING))
#define SRC_finish   (B(PROCESSING))
#define DST_finish   (B(SUCCEEDED) | B(FAILED_FINAL))
#define SRC_release  (B(PROCESSING))
#define DST_release  (B(FAILED_RETRYABLE))
#define SRC_discard  (B(PROCESSING))
#define DST_discard  (B(ABSENT))
#define SRC_recover  (B(PROCESSING))
#define DST_recover  (B(SUCCEEDED) | B(FAILED_RETRYABLE) | B(NEEDS_REVIEW))
#define SRC_postpone (B(PROCESSING))
#define DST_postpone (B(PROCESSING))
#define SRC_resolve  (B(PROCESSING) | B(NEEDS_REVIEW))
#define DST_resolve  (B(SUCCEEDED) | B(FAILED_RETRYABLE) | B(FAILED_FINAL))
#define SRC_purge    (B(SUCCEEDED) | B(FAILED_FINAL) | B(FAILED_RETRYABLE))
#define DST_purge    (B(ABSENT))

/* The only way a status changes: a move of the table, from a state it leaves. */
#define go(m, to) \
	assert((SRC_##m & B(status)) != 0 && (DST_##m & B(to)) != 0); \
	status = to

/* The row, as committed. */
mtype:state status = ABSENT;
byte owner = 0;        /* owner_token: the attempt that holds the record */
bool leased = false;   /* lease_until is in the future (lease mode) */
bool expired = false;  /* expires_at has passed: the window is over, the key is new */
byte resp = 0;         /* the stored response: whose effect it reports (0: no effect) */
byte rattempts = 0;    /* recovery_attempts */
byte lock = 0;         /* the client whose transaction holds the row (or its uncommitted insert) */

/* Owner tokens: attempt t of client c holds (c - 1) * TRIES + t, unique per attempt; recovery
 * and the operator hand the record a token no attempt holds. */
#define TOKEN(c, t) ((c) - 1) * (RETRIES + 1) + (t)
#define FENCED 255

/* Ghosts: what the properties are stated over; the protocol never reads them. */
byte effects = 0;            /* effects landed in the current window */
byte effect_of = 0;          /* the attempt (owner token) that made it */
bool stale_write = false;    /* a fenced write landed for an attempt that no longer owns the record */
bool purged_in_flight = false;
bool bad_answer = false;     /* a client was answered with something other than that effect's outcome */
byte stepping = 0;           /* the owner inside the step its renewal covers (B2) */
byte expiries = 0;

/* What a claim found (decided on one read, under the row's lock). */
#define A_CLAIM   1
#define A_REPLACE 2
#define A_RETRY   3
#define A_REPLAY  4
#define A_BUSY    5
#define A_SETTLE  6
#define A_LOST    7

#ifdef FLAW_NO_FENCE
/* Seeded flaw: the finish and the renewal forget the owner token. */
#define FENCE (status == PROCESSING)
#else
#define FENCE (status == PROCESSING && owner == tok)
#endif

/* A fenced write that lands: had the record been taken over, that is the flaw we look for. */
#define LANDS stale_write = stale_write || owner != tok

/* The answer a client gets must be the one effect's outcome in this window. */
inline check_answer(st, r) {
	if
	:: st == SUCCEEDED -> bad_answer = bad_answer || effects != 1 || effect_of != r
	:: st == FAILED_FINAL -> bad_answer = bad_answer || effects != 0
	:: else -> skip
	fi
}

/*
 * Crashes. A process that dies does nothing more, and its choices are its own until its
 * next shared step: so each crash, like each choice of what the work does, is taken at
 * the end of the shared step before it (one state instead of two, the same behaviours).
 * A client crashes at most CRASHES times; it then retries, as a client whose connection
 * dropped or whose response was lost does.
 */
#define CRASH (crashed < CRASHES) -> crashed++

/* The claim's decision on the row it read (idempotency/protocol/claim.py, _settle). */
inline decide() {
	if
	:: status == ABSENT -> act = A_CLAIM
#ifndef FLAW_NO_EXPIRY_AT_CLAIM
	:: status != ABSENT && expired -> act = A_REPLACE
#endif
	:: else ->
		if
		:: status == SUCCEEDED || status == FAILED_FINAL -> act = A_REPLAY
		:: status == FAILED_RETRYABLE -> act = A_RETRY
#ifndef ATOMIC
		:: status == PROCESSING && !leased -> act = A_SETTLE
#endif
		:: else -> act = A_BUSY
		fi
	fi
}

/* Take the record for attempt `tok`: a new row, a retry, or the replacement of an expired one. */
inline take() {
	if
	:: act == A_CLAIM ->
#ifdef FLAW_NO_UNIQUE
		if
		:: status != ABSENT -> phantom = true /* no index: a second row for the same key */
		:: else -> go(claim, PROCESSING)
		fi
#else
		go(claim, PROCESSING)
#endif
		rattempts = 0
	:: act == A_REPLACE -> go(replace, PROCESSING); rattempts = 0
	:: act == A_RETRY -> go(retry, PROCESSING)
	fi;
	if
	:: !phantom -> owner = tok; resp = 0; expired = false /* expires_at is cleared */
	:: else -> skip
	fi
}

/*
 * A lost lease, settled under the row's lock by asking the resolver (protocol/states.py's
 * recover): done, not done, or unknown (postponed, NEEDS_REVIEW after MAX_RESOLVE).
 * Every answer but "unknown" hands the record a new owner token: the fence.
 */
inline settle(out) {
	if
	:: effects == 1 -> go(recover, SUCCEEDED); resp = effect_of; out = SUCCEEDED
	:: effects == 0 -> go(recover, FAILED_RETRYABLE); resp = 0; out = FAILED_RETRYABLE
	:: rattempts + 1 >= MAX_RESOLVE -> go(recover, NEEDS_REVIEW); out = NEEDS_REVIEW
	:: rattempts + 1 < MAX_RESOLVE -> go(postpone, PROCESSING); leased = true; out = PROCESSING
	fi;
	rattempts++;
	if
	:: out != PROCESSING -> owner = FENCED; leased = false
	:: else -> skip
	fi
}

/* A DELETE of the row; purge_safe watches what it deletes. */
inline delete_row() {
	purged_in_flight = purged_in_flight || status == PROCESSING || status == NEEDS_REVIEW;
	expired = false; owner = 0; resp = 0; rattempts = 0
}

/* Lease mode: UPDATE ... WHERE owner_token = mine AND status = PROCESSING. */
inline finish_work() {
	atomic { lock == 0 ->
		if
		:: FENCE -> LANDS; go(finish, out); resp = (out == SUCCEEDED -> tok : 0); leased = false;
			check_answer(out, tok)
		:: else -> goto next                             /* LeaseLost: an error, the client retries */
		fi;
		if
		:: CRASH; goto next                              /* the response is lost */
		:: goto done
		fi }
}

proctype client(byte me; byte TRIES) {
	byte tries = 0, tok = 0, act = 0, crashed = 0;
	mtype:state out = ABSENT;
	bool phantom = false;
	bool fallback = false;   /* write-once: the key is held otherwise, the claim decides */

next:	/* an attempt: the first, or a retry after a crash, a lost response, a 409 or an error */
	if
	:: tries == TRIES -> goto done
	:: tries < TRIES && CRASH; tries++; goto next            /* crashed before the claim */
#ifdef ATOMIC
#ifdef WRITE_ONCE
	/* IN_FLIGHT "run": BEGIN; the work, its effect uncommitted (A3), no lock taken yet:
	 * duplicates run theirs too. Then the finished record's INSERT, below. */
	:: atomic { tries < TRIES && !fallback ->
		tries++; tok = TOKEN(me, tries); phantom = false;
		if
		:: out = SUCCEEDED                              /* the business write */
		:: out = FAILED_FINAL                           /* a business failure marked final */
		:: goto next                                    /* an exception: all rolls back */
		:: CRASH; goto next                             /* a crash during the work */
		fi };
		if
		:: atomic { lock != 0 && lock != me -> goto next }  /* the insert's bounded wait ran out: 409 */
		/* The INSERT: it waits while another transaction's uncommitted insert of the key
		 * holds its entry (A1), then finds the key free or held. */
		:: atomic { lock == 0 ->
			if
			:: status == ABSENT -> lock = me                 /* ours, uncommitted */
			:: status != ABSENT && !expired && (status == SUCCEEDED || status == FAILED_FINAL) ->
				/* A committed outcome holds the key: ours rolls back, its effect with it;
				 * the answer is that outcome. */
#ifdef FLAW_LOSER_COMMITS
				if :: out == SUCCEEDED -> effects++ :: else -> skip fi;  /* seeded: commits anyway */
#endif
				check_answer(status, resp); goto done
			:: else -> tries--; fallback = true; goto next   /* held otherwise: rolled back, the claim decides */
			fi }
		fi;
		if
		:: atomic { CRASH; lock = 0; goto next }           /* a crash before the COMMIT: nothing stays */
		:: atomic {                                        /* COMMIT: the record and the effect, at once */
			go(write_once, out); owner = tok; expired = false; rattempts = 0;
			if
			:: out == SUCCEEDED -> effects++; effect_of = tok; resp = tok
			:: else -> resp = 0
			fi;
			check_answer(out, tok); lock = 0;
			if
			:: CRASH; goto next                            /* the response is lost */
			:: goto done
			fi }
		fi
#define CLAIMS fallback
#else
#define CLAIMS true
#endif
	/* BEGIN; the claim: INSERT relying on the unique index, or SELECT ... FOR UPDATE. The
	 * transaction keeps the row's lock (or its uncommitted insert's entry) until it ends. */
	:: atomic { tries < TRIES && lock == 0 && CLAIMS ->
		tries++; tok = TOKEN(me, tries); phantom = false; lock = me; fallback = false;
		decide();
		if
		:: act == A_REPLAY -> check_answer(status, resp); lock = 0; goto done
		:: act == A_BUSY || act == A_SETTLE -> lock = 0; goto next       /* 409 */
		:: else -> skip
		fi;
		/* The work, in the transaction: nothing of it is visible before COMMIT. */
		if
		:: out = SUCCEEDED                              /* the business write */
		:: out = FAILED_FINAL                           /* a business failure marked final */
		:: lock = 0; goto next                          /* an exception: all rolls back */
		:: CRASH; lock = 0; goto next                   /* a crash after the claim or the effect */
		fi }
	:: tries < TRIES && lock != 0 && CLAIMS -> tries++; fallback = false; goto next  /* the bounded lock wait ran out: 409 */
#ifdef FLAW_NO_UNIQUE
	/* Seeded flaw: check, then insert; without the index nothing waits for our row. */
	:: atomic { tries < TRIES && status == ABSENT ->
		tries++; tok = TOKEN(me, tries); phantom = false; act = A_CLAIM;
		if
		:: out = SUCCEEDED
		:: out = FAILED_FINAL
		fi }
#endif
	fi;
#ifndef FLAW_FINISH_OUTSIDE_TX
	atomic {                                            /* COMMIT: the record and the effect */
		take();
		if
		:: !phantom -> go(finish, out)
		:: else -> skip
		fi;
		if
		:: out == SUCCEEDED -> effects++; effect_of = tok; resp = (phantom -> resp : tok)
		:: else -> skip
		fi;
		check_answer(out, tok);
		if :: lock == me -> lock = 0 :: else -> skip fi;
		if
		:: CRASH; goto next                             /* the response is lost */
		:: goto done
		fi
	}
#else
	/* Seeded flaw: the claim and the effect commit; the finish is a second transaction. */
	atomic {
		take();
		if
		:: out == SUCCEEDED -> effects++; effect_of = tok
		:: else -> skip
		fi;
		if :: lock == me -> lock = 0 :: else -> skip fi;
		if
		:: CRASH; goto next
		:: skip
		fi
	}
	atomic { lock == 0 ->
		if
		:: FENCE -> LANDS; go(finish, out); resp = (out == SUCCEEDED -> tok : 0); check_answer(out, tok)
		:: else -> skip
		fi;
		goto done }
#endif
#else
	/* Lease mode: the claim is a short transaction of its own, committed before the work.
	 * It holds the row's lock from its read to its commit: nothing but the clock could come
	 * between them, so it is one step. A lost lease it meets is settled by the resolver. */
	:: atomic { tries < TRIES && lock == 0 ->
		tries++; tok = TOKEN(me, tries); phantom = false;
		decide();
		if
		:: act == A_REPLAY -> check_answer(status, resp); goto done
		:: act == A_CLAIM || act == A_REPLACE || act == A_RETRY -> take(); leased = true
		:: act == A_SETTLE ->
			settle(out);
			if
			:: out == SUCCEEDED -> check_answer(status, resp); goto done    /* done: replayed */
			:: out == FAILED_RETRYABLE ->                 /* not done: this request runs it, once */
				go(retry, PROCESSING); owner = tok; leased = true
			:: else -> goto next                          /* unknown or under review: 409 */
			fi
		:: else -> goto next                              /* in flight or under review: 409 */
		fi;
		if
		:: CRASH; goto next                               /* a crash after the claim */
		:: skip
		fi }
	fi;
	/* The work, outside any transaction; what it does next is fenced by the owner token. */
	if
	:: atomic { lock == 0 ->                             /* it raises (B3): the key is released */
		if
		:: FENCE -> LANDS; go(release, FAILED_RETRYABLE); leased = false
		:: else -> skip
		fi;
		goto next }
	:: atomic { lock == 0 ->                             /* nothing to record: the row goes */
		if
		:: FENCE -> LANDS; go(discard, ABSENT); delete_row(); leased = false
		:: else -> skip
		fi;
		goto done }
	:: out = FAILED_FINAL; finish_work()                 /* a business failure marked final */
	:: atomic { lock == 0 ->                             /* renew, then the external effect (B2) */
		if
		:: FENCE -> LANDS; go(renew, PROCESSING); leased = true; stepping = tok
		:: else -> goto next                             /* LeaseLost: stop before the effect */
		fi };
		if
		:: atomic { CRASH; stepping = 0; goto next }      /* a crash inside the step */
		:: atomic { effects++; effect_of = tok; stepping = 0; out = SUCCEEDED;
			if
			:: CRASH; goto next                          /* a crash after the effect */
			:: skip
			fi };
			finish_work()
		fi
	fi;
#endif
done:
	skip
}

/* The database's clock: leases run out (except inside a covered step, B2); windows close. */
proctype clock() {
end:
	do
	:: atomic { status == PROCESSING && leased && stepping != owner -> leased = false }
	:: atomic { expiries < EXPIRIES && !expired && (B(status) & PURGEABLE) != 0 ->
		/* The window is over: a new one starts for the key, with no effect yet. */
		expired = true; expiries++; effects = 0; effect_of = 0 }
	od
}

/* The purge: expired finished rows, skipping locked ones (it never waits for a lock). */
proctype purge() {
end:
	do
	:: atomic { lock == 0 && expired && (B(status) & PURGEABLE) != 0 ->
		delete_row(); go(purge, ABSENT) }
#ifdef FLAW_PURGE_IN_FLIGHT
	/* Seeded flaw: the filter forgets the status, and a lost lease looks expired. */
	:: atomic { lock == 0 && status == PROCESSING && !leased -> delete_row(); status = ABSENT }
#endif
	od
}

#ifndef ATOMIC
/* Recovery (the beat task): expired leases, under SKIP LOCKED, settled by the resolver. */
proctype recovery() {
	mtype:state out = ABSENT;
end:
	do
	:: atomic { lock == 0 && status == PROCESSING && !leased -> settle(out) }
	od
}

/* One operator action: a record under review, or a lost lease, settled by what they know (B1). */
proctype operator() {
end:
	if
	:: skip                                             /* nobody looks: no fairness forces them */
	:: atomic { lock == 0 && (status == NEEDS_REVIEW || (status == PROCESSING && !leased)) ->
		if
		:: effects == 1 -> go(resolve, SUCCEEDED); resp = effect_of
		:: effects == 0 -> go(resolve, FAILED_RETRYABLE); resp = 0
		:: effects == 0 -> go(resolve, FAILED_FINAL); resp = 0
		:: effects > 1 -> skip
		fi;
		owner = FENCED; leased = false }
	fi
}
#endif

#ifdef LIVENESS
/* Time passes while nothing else moves. Spin's weak fairness judges infinite runs; this
 * makes a run where every other process has stopped (a record left in flight, nobody to
 * settle it) an infinite one, instead of one its fairness check passes over. */
proctype idle() {
	bit tick;                                           /* Spin refuses a loop that changes nothing */
end:
	do
	:: tick = 1 - tick
	od
}
#endif

init {
	byte i = 1;
	atomic {
		do
#ifdef ATOMIC
		:: i <= CLIENTS -> run client(i, RETRIES + 1); i++
#else
		:: i <= CLIENTS -> run client(i, (i == 1 -> RETRIES + 1 : 1)); i++
#endif
		:: i > CLIENTS -> break
		od;
		run clock();
		run purge();
#ifndef ATOMIC
#ifndef FLAW_NO_RECOVERY
		run recovery();
#endif
		run operator();
#endif
#ifdef LIVENESS
		run idle();
#endif
	}
}

/* The properties: scripts/model-check.sh checks each by name (pan -N). */
ltl one_effect { [] (effects <= 1) }
ltl true_replays { [] !bad_answer }
ltl fenced { [] !stale_write }
ltl purge_safe { [] !purged_in_flight }
#ifdef ATOMIC
/* The record is committed (as SUCCEEDED) if and only if its effect is, within the window. */
ltl all_or_nothing { [] (expired || (((status == SUCCEEDED) -> (effects == 1)) && ((effects == 1) -> (status == SUCCEEDED)))) }
#else
/* With recovery running (weak fairness, pan -f), no record stays in flight forever. */
ltl settles { <> [] (status != PROCESSING) }
#endif
