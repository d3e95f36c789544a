-- The job store's schema as perseus made it before schema migrations (commit 45a2241,
-- Store.create_schema: metadata.create_all, no alembic_version table).
-- PostgreSQL: the statements create_all issued (SQLAlchemy's postgresql dialect).

CREATE TABLE perseus_jobs (
	id VARCHAR(64) NOT NULL, 
	name VARCHAR(200), 
	token_hash VARCHAR(64) NOT NULL, 
	created_at_s FLOAT NOT NULL, 
	updated_at_s FLOAT NOT NULL, 
	spec JSON NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	reason TEXT, 
	policy JSON NOT NULL, 
	straggler JSON, 
	version INTEGER NOT NULL, 
	frontier_rev INTEGER NOT NULL, 
	policy_index INTEGER, 
	chosen_index INTEGER, 
	ranks_registered INTEGER NOT NULL, 
	profiles_reported INTEGER NOT NULL, 
	iterations_reported INTEGER NOT NULL, 
	planning_owner VARCHAR(64), 
	planning_heartbeat_s FLOAT, 
	planning_s FLOAT, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_perseus_jobs_state ON perseus_jobs (state);

CREATE TABLE perseus_frontiers (
	job_id VARCHAR(64) NOT NULL, 
	rev INTEGER NOT NULL, 
	data TEXT NOT NULL, 
	PRIMARY KEY (job_id), 
	FOREIGN KEY(job_id) REFERENCES perseus_jobs (id)
);

CREATE TABLE perseus_ranks (
	job_id VARCHAR(64) NOT NULL, 
	rank INTEGER NOT NULL, 
	stage INTEGER NOT NULL, 
	data_parallel_rank INTEGER NOT NULL, 
	tensor_parallel_rank INTEGER NOT NULL, 
	gpu_name VARCHAR(200) NOT NULL, 
	supported_clocks_mhz JSON NOT NULL, 
	registered_at_s FLOAT NOT NULL, 
	iterations INTEGER NOT NULL, 
	last_iteration INTEGER, 
	window_version INTEGER NOT NULL, 
	recent_times_s JSON NOT NULL, 
	recent_energies_j JSON NOT NULL, 
	host VARCHAR(255), 
	PRIMARY KEY (job_id, rank), 
	UNIQUE (job_id, stage, data_parallel_rank, tensor_parallel_rank), 
	FOREIGN KEY(job_id) REFERENCES perseus_jobs (id)
);

CREATE TABLE perseus_profiles (
	job_id VARCHAR(64) NOT NULL, 
	rank INTEGER NOT NULL, 
	stage INTEGER NOT NULL, 
	rows JSON NOT NULL, 
	p_block_w FLOAT, 
	reported_at_s FLOAT NOT NULL, 
	PRIMARY KEY (job_id, rank), 
	FOREIGN KEY(job_id) REFERENCES perseus_jobs (id)
);
