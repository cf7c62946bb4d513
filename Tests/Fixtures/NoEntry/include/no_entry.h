int not_a_plugin(void);
