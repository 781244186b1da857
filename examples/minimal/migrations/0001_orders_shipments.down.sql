DROP TABLE shipments;
DROP TABLE orders;
