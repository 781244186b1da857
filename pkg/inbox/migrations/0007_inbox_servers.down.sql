DROP TABLE IF EXISTS inbox_servers;
